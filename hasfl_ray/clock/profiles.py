"""Device profiles: every client's compute speed (MACs/s), download and upload bandwidth (bytes/s) and latency (s),
as numpy arrays (a million clients: 32 MB), from a CSV trace, per-tier values or seeded distributions.

The seeded draws come from the run's own device stream (``rng(seed, STREAM_DEVICES)``), drawn once in the driver:
the same seed gives the same devices on every backend and actor count, and nothing else draws from it, so turning
a device population on changes no training stream. docs/clock.md describes the trace format and cites the
defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.clock.spec import DEVICE_BOUNDS, bound_text
from hasfl_ray.clock.trace import (DEVICE_KINDS, TRACE_AVAILABILITY, TRACE_EXPECTED,  # noqa: F401 (their former home)
                                   TRACE_ID_COLUMNS, TRACE_NUMBER_COLUMNS, read_trace_arrays)
from hasfl_ray.errors import ConfigError
from hasfl_ray.training.seeding import STREAM_DEVICES, numpy_rng

#: clients.csv's device columns (written only when a device population is configured).
PROFILE_COLUMNS = ("speed_macs_per_s", "down_bytes_per_s", "up_bytes_per_s", "latency_s")


@dataclass
class DeviceProfiles:
    """Every client's device, float64 arrays of shape (num_clients,).

    Attributes:
        speed: training throughput, MACs per second.
        down, up: download and upload bandwidth, bytes per second.
        latency: seconds added once to each round a client takes part in.
        intervals: the trace's availability: ``(offsets, starts, ends, period)`` in CSR form (client i's on-intervals
            are ``starts[offsets[i]:offsets[i+1]]`` .. ``ends[...]``, seconds, repeating every ``period`` seconds;
            a client with none is always available), or None when the trace gives none.
        source: what they came from, in words.
    """

    speed: np.ndarray
    down: np.ndarray
    up: np.ndarray
    latency: np.ndarray
    intervals: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray, float]] = None
    source: str = ""

    def __len__(self) -> int:
        return len(self.speed)

    def row(self, client: int) -> Dict[str, float]:
        """One client's device as a mapping of :data:`PROFILE_COLUMNS`."""
        return dict(zip(PROFILE_COLUMNS, (float(self.speed[client]), float(self.down[client]), float(self.up[client]),
                                          float(self.latency[client]))))


def draw_profiles(spec: Mapping[str, Any], seed: int, num_clients: int) -> DeviceProfiles:
    """Profiles drawn from ``spec`` (``devices: {distribution: lognormal|pareto, ...}``, normalised by
    :func:`hasfl_ray.clock.spec.normalise_devices`) with ``rng(seed, STREAM_DEVICES)``: the speeds, then the
    download, upload and latency draws, each one vector of ``num_clients`` values."""
    rng = numpy_rng(seed, STREAM_DEVICES)
    with np.errstate(over="ignore", under="ignore"):  # a draw beyond the bounds is refused below, by name
        if spec["distribution"] == "pareto":  # classic Pareto of minimum x_m and shape alpha
            speed = spec["speed_min"] * (1.0 + rng.pareto(spec["speed_shape"], num_clients))
        else:
            speed = spec["speed_median"] * np.exp(spec["speed_sigma"] * rng.standard_normal(num_clients))
        down, up, latency = (spec[f"{name}_median"] * np.exp(spec[f"{name}_sigma"] *
                                                              rng.standard_normal(num_clients))
                             for name in ("down", "up", "latency"))
    for kind, values in zip(("speed", "down", "up", "latency"), (speed, down, up, latency)):
        low, high, unit = DEVICE_BOUNDS[kind]
        outside = (values < low) | (values > high) | ~np.isfinite(values)  # (low is 1 for a rate: never 0)
        if outside.any():
            client = int(np.argmax(outside))
            given = ((f"speed_min {spec['speed_min']:g}, speed_shape {spec['speed_shape']:g}")
                     if kind == "speed" and spec["distribution"] == "pareto" else
                     f"{kind}_median {spec[kind + '_median']:g}, {kind}_sigma {spec[kind + '_sigma']:g}")
            fix = "a larger speed_shape" if kind == "speed" and spec["distribution"] == "pareto" else \
                f"a smaller {kind}_sigma"
            raise ConfigError(f"devices ({spec['distribution']}: {given}) drew {kind} {float(values[client]):.3g} "
                              f"{unit} for client {client}; expected every draw within {bound_text(kind)} "
                              f"({fix})")
    return DeviceProfiles(speed, down, up, latency, source=f"{spec['distribution']} distribution")


def tier_profiles(tiers: Sequence[Mapping[str, float]], p_max: np.ndarray) -> DeviceProfiles:
    """Profiles from per-tier devices (``devices: {tiers: [...]}``): client i gets the device of its capacity
    tier p_i^max (the run's tier draw); one sentence when a tier present in the run has no device."""
    widths = np.array([tier["width"] for tier in tiers])
    index = np.searchsorted(widths, p_max)
    index = np.minimum(index, len(widths) - 1)
    missing = ~np.isclose(widths[index], p_max, rtol=0, atol=1e-9)
    if missing.any():
        width = float(p_max[np.argmax(missing)])
        raise ConfigError(f"devices.tiers has no device for width {width:g}, the p^max of client "
                          f"{int(np.argmax(missing))}; expected one entry for each width of the run's tiers "
                          f"({', '.join(format(w, 'g') for w in np.unique(p_max))})")
    columns = [np.array([tier[key] for tier in tiers], dtype=np.float64)[index]
               for key in ("speed", "down", "up", "latency")]
    return DeviceProfiles(*columns, source="per-tier values")


def read_trace(path: str, num_clients: int, names: Optional[Sequence[str]] = None,
               total: Optional[int] = None) -> DeviceProfiles:
    """Profiles from the CSV trace ``path`` (docs/clock.md, "Trace format"), read streamed after a memory estimate
    (:func:`hasfl_ray.clock.trace.read_trace_arrays`: ``total`` is the memory to fit in, this machine's by
    default). With a ``client`` column each client of the run has its row (ids 0..N-1, each once); with ``name``,
    the rows are matched to the dataset's client names; with neither, the rows are a pool of devices dealt in order
    (client i takes row i mod rows). One :class:`DataError` sentence for a malformed file."""
    columns, intervals = read_trace_arrays(path, num_clients, names, total)
    return DeviceProfiles(*columns, intervals=intervals, source=f"trace {path}")

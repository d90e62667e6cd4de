"""Device profiles: every client's compute speed (MACs/s), download and upload bandwidth (bytes/s) and latency (s),
as numpy arrays (a million clients: 32 MB), from a CSV trace, per-tier values or seeded distributions.

The seeded draws come from the run's own device stream (``rng(seed, STREAM_DEVICES)``), drawn once in the driver:
the same seed gives the same devices on every backend and actor count, and nothing else draws from it, so turning
a device population on changes no training stream. docs/clock.md describes the trace format and cites the
defaults."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.clock.spec import DEVICE_BOUNDS, MAX_SECONDS, MIN_PERIOD, bound_text
from hasfl_ray.errors import ConfigError, DataError
from hasfl_ray.files import read_text
from hasfl_ray.training.seeding import STREAM_DEVICES, numpy_rng

#: The trace's columns (docs/clock.md, "Trace format"): one of the first two may name the client; the four numbers
#: are required; availability is optional.
TRACE_ID_COLUMNS = ("client", "name")
TRACE_NUMBER_COLUMNS = ("speed_macs_per_s", "down_bytes_per_s", "up_bytes_per_s", "latency_s")
TRACE_AVAILABILITY = "availability"

#: The kind of device value (:data:`hasfl_ray.clock.spec.DEVICE_BOUNDS`) each number column holds.
DEVICE_KINDS = ("speed", "down", "up", "latency")

#: clients.csv's device columns (written only when a device population is configured).
PROFILE_COLUMNS = ("speed_macs_per_s", "down_bytes_per_s", "up_bytes_per_s", "latency_s")

TRACE_EXPECTED = ("a CSV with a header of speed_macs_per_s, down_bytes_per_s, up_bytes_per_s, latency_s (optional: "
                  "client or name, availability), docs/clock.md")


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


def read_trace(path: str, num_clients: int, names: Optional[Sequence[str]] = None) -> DeviceProfiles:
    """Profiles from the CSV trace ``path`` (docs/clock.md, "Trace format"). With a ``client`` column each client
    of the run has its row (ids 0..N-1, each once); with ``name``, the rows are matched to the dataset's client
    names; with neither, the rows are a pool of devices dealt in order (client i takes row i mod rows). One
    :class:`DataError` sentence for a malformed file."""
    what = "device trace"
    text = read_text(path, what, TRACE_EXPECTED)
    rows = [row for row in csv.reader(io.StringIO(text)) if row and not row[0].lstrip().startswith("#")]
    if not rows:
        raise DataError(f"{what} {path!r} is empty; expected {TRACE_EXPECTED}")
    header = [name.strip() for name in rows[0]]
    missing = [name for name in TRACE_NUMBER_COLUMNS if name not in header]
    unknown = [name for name in header if name not in TRACE_ID_COLUMNS + TRACE_NUMBER_COLUMNS + (TRACE_AVAILABILITY,)]
    if missing or unknown or len(set(header)) != len(header):
        problem = (f"has no column {missing[0]!r}" if missing else f"has an unknown column {unknown[0]!r}"
                   if unknown else "names a column twice")
        raise DataError(f"{what} {path!r} {problem}; expected {TRACE_EXPECTED}")
    body = rows[1:]
    if not body:
        raise DataError(f"{what} {path!r} has a header but no device rows; expected one row per device")
    ids = [name for name in TRACE_ID_COLUMNS if name in header]
    if len(ids) > 1:
        raise DataError(f"{what} {path!r} has both a client and a name column; expected one of them")
    numbers = np.empty((len(body), 4), dtype=np.float64)
    spans: List[List[Tuple[float, float]]] = []
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DataError(f"{what} {path!r} has {len(row)} fields on line {line}; expected {len(header)}, one per "
                            "column")
        cells = dict(zip(header, (cell.strip() for cell in row)))
        for k, (name, kind) in enumerate(zip(TRACE_NUMBER_COLUMNS, DEVICE_KINDS)):
            try:
                value = float(cells[name])
            except ValueError:
                value = math.nan
            low, high, _ = DEVICE_BOUNDS[kind]
            if not (math.isfinite(value) and low <= value <= high):  # (low is 1 for a rate: never 0)
                raise DataError(f"{what} {path!r} has {name} {cells[name]!r} on line {line}; expected a number "
                                f"within {bound_text(kind)}")
            numbers[line - 2, k] = value
        spans.append(_intervals(cells.get(TRACE_AVAILABILITY, ""), path, line))
    order = _row_of_client(body, header, ids[0] if ids else None, num_clients, names, path)
    intervals = None
    if any(spans):
        period = max(end for client_spans in spans for _, end in client_spans)
        if period < MIN_PERIOD:  # time / period would overflow the cycle count, or lose every digit of the time
            raise DataError(f"{what} {path!r} has an availability period of {period:g} s (its largest END); "
                            f"expected at least {MIN_PERIOD:g} s")
        counts = np.array([len(spans[r]) for r in order], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        flat = [span for r in order for span in spans[r]]
        intervals = (offsets, np.array([s for s, _ in flat], dtype=np.float64),
                     np.array([e for _, e in flat], dtype=np.float64), float(period))
    columns = [np.ascontiguousarray(numbers[order, k]) for k in range(4)]
    return DeviceProfiles(*columns, intervals=intervals, source=f"trace {path}")


def _intervals(text: str, path: str, line: int) -> List[Tuple[float, float]]:
    """``START-END START-END ...`` (seconds, ascending, not overlapping) as pairs, intervals that touch joined into
    one (``0-0.05 0.05-100`` is ``0-100``: a client on across the joint never goes off there); empty: always
    available."""
    out: List[Tuple[float, float]] = []
    for part in text.split():
        start, dash, end = part.partition("-")
        try:
            pair = (float(start), float(end)) if dash else None
        except ValueError:
            pair = None
        if pair is None or not all(math.isfinite(x) for x in pair) or not 0 <= pair[0] < pair[1] <= MAX_SECONDS \
                or (out and pair[0] < out[-1][1]):
            raise DataError(f"device trace {path!r} has availability interval {part!r} on line {line}; expected "
                            f"START-END seconds, 0 <= START < END <= {MAX_SECONDS:g}, ascending, not overlapping, "
                            "space-separated (0-3600 7200-10800)")
        if out and pair[0] == out[-1][1]:
            out[-1] = (out[-1][0], pair[1])
        else:
            out.append(pair)
    return out


def _row_of_client(body: Sequence[Sequence[str]], header: Sequence[str], id_column: Optional[str], num_clients: int,
                   names: Optional[Sequence[str]], path: str) -> np.ndarray:
    """The trace row of every client of the run (see :func:`read_trace`)."""
    what = f"device trace {path!r}"
    if id_column is None:
        return np.arange(num_clients, dtype=np.int64) % len(body)
    position = header.index(id_column)
    keys = [row[position].strip() for row in body]
    if id_column == "client":
        wanted = [str(i) for i in range(num_clients)]
        try:
            keys = [str(int(key)) for key in keys]
        except ValueError:
            bad = next(key for key in keys if not key.lstrip("-").isdigit())
            raise DataError(f"{what} has client {bad!r}; expected client ids 0 to {num_clients - 1}") from None
    else:
        wanted = [str(name) for name in (names or [])]
    rows: Dict[str, int] = {}
    for r, key in enumerate(keys):
        if key in rows:
            raise DataError(f"{what} gives {id_column} {key!r} twice; expected each {id_column} once")
        rows[key] = r
    absent = [key for key in wanted if key not in rows]
    if absent:
        raise DataError(f"{what} has no row for {id_column} {absent[0]!r} ({len(absent)} of the run's "
                        f"{num_clients} clients have none); expected a row for every client")
    return np.array([rows[key] for key in wanted], dtype=np.int64)

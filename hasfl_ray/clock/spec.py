"""The clock's config keys, checked and normalised (what :class:`~hasfl_ray.config.RunConfig` calls): the
device population (``devices``), the availability model, the deadline and its policy, and the dropout probability.
Pure values only: no file is read here (the trace is read when the run is built, :mod:`hasfl_ray.clock.profiles`).

docs/clock.md describes every key."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import FLOAT32_MAX, finite_number

#: The seeded distributions a device population may be drawn from (``devices: lognormal``).
DISTRIBUTIONS = ("lognormal", "pareto")

#: What a late client's update becomes under a deadline (docs/clock.md, "Deadlines").
POLICIES = ("drop", "partial", "overselect")

#: The overselection fraction F of ``deadline_policy: overselect`` when ``overselect`` is not given.
DEFAULT_OVERSELECT = 0.3

#: The seeded distributions' parameters and their defaults (docs/clock.md cites the source of each): speeds in
#: MACs/s, bandwidths in bytes/s, latency in seconds; a *_sigma is the standard deviation of the log.
DISTRIBUTION_DEFAULTS: Dict[str, float] = {
    "speed_median": 2e9, "speed_sigma": 0.8,          # lognormal speeds
    "speed_min": 1e9, "speed_shape": 2.0,             # Pareto speeds: minimum x_m and shape alpha
    "down_median": 6.25e6, "down_sigma": 0.8,         # 50 Mbit/s
    "up_median": 1.375e6, "up_sigma": 0.8,            # 11 Mbit/s
    "latency_median": 0.03, "latency_sigma": 0.5,     # 30 ms
}

#: A per-tier device's keys (``devices: {tiers: [...]}``): the tier's width, then its device.
TIER_KEYS = ("width", "speed", "down", "up", "latency")

#: The bounds of every device value, whatever its source (a trace, tiers, a distribution's parameters and each of
#: its draws; docs/clock.md, "Bounds"): (least, most, unit). Within them every time the clock computes is a finite,
#: nonzero number of seconds: a subnormal speed made a round take infinite seconds, ``speed_sigma: 1000`` drew
#: speeds of 0 and infinity. A rate beyond 1e21 (a zetta-MAC or a zettabyte a second) is no device; one below 1 a
#: second times a model's MACs in years.
DEVICE_BOUNDS: Dict[str, Tuple[float, float, str]] = {
    "speed": (1.0, 1e21, "MACs/s"), "down": (1.0, 1e21, "bytes/s"), "up": (1.0, 1e21, "bytes/s"),
    "latency": (0.0, 1e9, "s")}
#: The most simulated seconds a latency, an availability interval's end or a Markov period's mean may be (about 32
#: years): beyond it a trace's cycle or a Markov chain overflows the float range the clock counts time in.
MAX_SECONDS = 1e9
#: The least a Markov period's mean and a trace's period (its largest END) may be, seconds: a shorter one falls
#: below the resolution of the times it is compared with (a chain that never moves past the time asked, a cycle
#: count that overflows).
MIN_PERIOD = 1e-3


def bound_text(kind: str) -> str:
    """A device value's bounds in words: ``[1, 1e+21] MACs/s``."""
    low, high, unit = DEVICE_BOUNDS[kind]
    return f"[{low:g}, {high:g}] {unit}"


def within_bounds(kind: str, value: Any) -> bool:
    """Whether ``value`` is a number within :data:`DEVICE_BOUNDS` of ``kind`` (> 0 for every kind but latency)."""
    low, high, _ = DEVICE_BOUNDS[kind]
    return finite_number(value) and low <= value <= high  # (low is 1 for a rate: never 0)

#: ``devices`` in words, for the sentences that refuse one.
DEVICES_EXPECTED = ("a trace PATH.csv, fedscale:PATH, lognormal or pareto, or a mapping of one of trace, fedscale, "
                    "tiers or distribution (docs/clock.md)")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def _refuse(name: str, value: Any, expected: str, after: str = "") -> ConfigError:
    """One sentence refusing ``value`` of ``name``; a number beyond float32's range (``1e39``, ``1e308``) is told the
    bound, which :func:`~hasfl_ray.registry.finite_number` holds every real-valued key to."""
    big = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (isinstance(value, int) or not math.isnan(value)) and abs(value) > FLOAT32_MAX
    bound = f" and at most {FLOAT32_MAX:.2g}, float32's largest" if big else ""
    return ConfigError(f"{name} is {_shown(value)}; expected {expected}{bound}{after}")


def _keys(mapping: Mapping[Any, Any]) -> Dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in mapping.items()}


def normalise_devices(value: Any) -> Optional[Dict[str, Any]]:
    """``devices`` as its one mapping form (None: no device population, no clock): ``{"trace": PATH}``,
    ``{"tiers": [{width, speed, down, up, latency}, ...]}`` (ascending widths) or ``{"distribution": NAME, <every
    parameter>}`` (defaults filled in, so config.yaml records the values a run used); one sentence otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in DISTRIBUTIONS:
            return normalise_devices({"distribution": text.lower()})
        if text.lower().endswith(".csv"):
            return {"trace": text}
        if text.startswith("fedscale:") and text[len("fedscale:"):].strip():  # FedScale's capacity pickle
            return {"fedscale": text[len("fedscale:"):].strip()}
        raise _refuse("devices", value, DEVICES_EXPECTED)
    if not isinstance(value, Mapping):
        raise _refuse("devices", value, DEVICES_EXPECTED)
    values = _keys(value)
    if "fedscale" in values:
        path = values["fedscale"]
        if len(values) != 1 or not isinstance(path, str) or not path.strip():
            raise _refuse("devices", value, "{fedscale: PATH} (FedScale's client_device_capacity pickle, "
                                            "docs/clock.md) and no other key")
        return {"fedscale": path.strip()}
    kinds = [k for k in ("trace", "tiers", "distribution") if k in values]
    if len(kinds) != 1:
        raise _refuse("devices", value, DEVICES_EXPECTED)
    kind = kinds[0]
    if kind == "trace":
        path = values["trace"]
        if len(values) != 1 or not isinstance(path, str) or not path.strip():
            raise _refuse("devices", value, "{trace: PATH.csv} (a device trace, docs/clock.md) and no other key")
        return {"trace": path}
    if kind == "tiers":
        if len(values) != 1:
            raise _refuse("devices", value, "{tiers: [...]} and no other key")
        return {"tiers": _tiers(values["tiers"])}
    name = values.pop("distribution")
    if name not in DISTRIBUTIONS:
        raise _refuse("devices.distribution", name, " or ".join(DISTRIBUTIONS))
    out: Dict[str, Any] = {"distribution": name}
    for key, default in DISTRIBUTION_DEFAULTS.items():
        given = values.pop(key, default)
        kind = key.split("_")[0]
        if key.endswith(("_median", "_min")):  # a value of the device itself: within its bounds
            if not within_bounds(kind, given) or given <= 0:  # (a median latency of 0 has no log)
                raise _refuse(f"devices.{key}", given, f"a number > 0 within {bound_text(kind)}")
        elif not finite_number(given) or given <= 0:  # a spread (sigma, shape): its draws are checked
            raise _refuse(f"devices.{key}", given, "a finite number > 0")
        out[key] = float(given)
    if values:
        unknown = sorted(values)[0]
        raise ConfigError(f"devices has unknown key {unknown!r}; expected distribution and its parameters "
                          f"({', '.join(DISTRIBUTION_DEFAULTS)})")
    return out


def _tiers(value: Any) -> List[Dict[str, float]]:
    """Per-tier devices as a list of {width, speed, down, up, latency} in ascending width (a mapping of width ->
    device is accepted too)."""
    expected = "a list of {width, speed, down, up, latency}, one a width, or a mapping of width -> {speed, down, up, latency}"
    if isinstance(value, Mapping):
        value = [{"width": width, **(device if isinstance(device, Mapping) else {"speed": device})}
                 for width, device in value.items()]
    if not isinstance(value, (list, tuple)) or not value:
        raise _refuse("devices.tiers", value, expected)
    out = []
    for entry in value:
        if not isinstance(entry, Mapping):
            raise _refuse("devices.tiers", value, expected)
        entry = _keys(entry)
        if sorted(entry) != sorted(TIER_KEYS):
            raise _refuse("devices.tiers entry", dict(entry), expected)
        for key in TIER_KEYS:
            number = entry[key]
            if key == "width" and not (finite_number(number) and 0 < number <= 1):
                raise _refuse(f"devices.tiers {key}", number, "a width in (0, 1]")
            if key != "width" and not within_bounds(key, number):
                raise _refuse(f"devices.tiers {key}", number, f"a number within {bound_text(key)}")
        out.append({key: float(entry[key]) for key in TIER_KEYS})
    widths = [entry["width"] for entry in out]
    if len(set(widths)) != len(widths):
        raise _refuse("devices.tiers", value, "each width once")
    return sorted(out, key=lambda entry: entry["width"])


def parse_markov(text: str) -> Optional[Tuple[float, float]]:
    """(mean on seconds, mean off seconds) of ``markov:ON,OFF``, None when it is not that."""
    match = re.fullmatch(r"\s*markov\s*:\s*([^,]+),([^,]+)", text) if isinstance(text, str) else None
    if not match:
        return None
    try:
        on, off = float(match.group(1)), float(match.group(2))
    except ValueError:
        return None
    if not all(math.isfinite(x) and MIN_PERIOD <= x <= MAX_SECONDS for x in (on, off)):
        return None  # (a mean below MIN_PERIOD or beyond MAX_SECONDS is refused too: docs/clock.md, "Bounds")
    return on, off


def normalise_availability(value: Any) -> Optional[str]:
    """``availability``: None (the trace's intervals where it gives them, else always available), ``always``,
    ``trace`` or ``markov:ON,OFF`` (mean seconds on and off, written back as ``markov:{on:g},{off:g}``)."""
    if value is None:
        return None
    if value in ("always", "trace"):
        return value
    if isinstance(value, str) and value.strip().startswith("fedscale:") and value.strip()[len("fedscale:"):].strip():
        return "fedscale:" + value.strip()[len("fedscale:"):].strip()  # FedScale's client_behave_trace pickle
    markov = parse_markov(value)
    if markov is None:
        raise _refuse("availability", value, f"always, trace, fedscale:PATH or markov:ON,OFF (mean seconds on "
                                             f"and off, each in [{MIN_PERIOD:g}, {MAX_SECONDS:g}]), e.g. "
                                             "markov:3600,1800")
    return f"markov:{markov[0]:g},{markov[1]:g}"


def check_clock_keys(devices: Any, availability: Any, deadline: Any, policy: Any, overselect: Any,
                     dropout: Any) -> Dict[str, Any]:
    """The clock's config keys normalised (a mapping of the fields to set), or one sentence: a malformed value, or a
    key that needs another (every clock key needs ``devices``; ``partial`` and ``drop`` need a deadline;
    ``overselect`` needs that policy; ``availability: trace`` needs a trace)."""
    devices = normalise_devices(devices)
    availability = normalise_availability(availability)
    if deadline is not None and (not finite_number(deadline) or deadline <= 0):
        raise _refuse("deadline", deadline, "a number of simulated seconds > 0", " (or no deadline)")
    if policy not in POLICIES:
        raise _refuse("deadline_policy", policy, " or ".join(POLICIES))
    if overselect is not None:
        if not finite_number(overselect) or not 0 < overselect <= 10:
            raise _refuse("overselect", overselect, "a fraction F > 0 (invite (1+F)K clients), at most 10")
        if policy != "overselect":
            raise ConfigError(f"overselect is {overselect!r} but deadline_policy is {policy!r}; expected "
                              "deadline_policy overselect with it")
        overselect = float(overselect)
    elif policy == "overselect":
        overselect = DEFAULT_OVERSELECT
    if not finite_number(dropout) or not 0 <= dropout < 1:
        raise _refuse("dropout", dropout, "a probability in [0, 1)")
    if policy in ("partial",) and deadline is None:
        raise ConfigError(f"deadline_policy is {policy!r} but deadline is not set; expected --deadline SECONDS with "
                          "it")
    if devices is None:
        given = [(name, value) for name, value, default in (
            ("deadline", deadline, None), ("availability", availability, None),
            ("deadline_policy", policy, "drop"), ("dropout", dropout, 0)) if value != default]
        if given:
            raise ConfigError(f"{given[0][0]} is {_shown(given[0][1])} but devices is not set; expected devices (a "
                              "trace PATH.csv, lognormal or pareto: --devices) for the clock to time rounds")
    if availability == "trace" and devices is not None and "trace" not in devices:
        raise ConfigError(f"availability is 'trace' but devices is {_shown(devices)}; expected a device trace "
                          "(devices: PATH.csv) whose availability column gives the intervals")
    return {"devices": devices, "availability": availability, "deadline": None if deadline is None else
            float(deadline), "deadline_policy": policy, "overselect": overselect, "dropout": float(dropout)}

"""FedScale's device traces (docs/clock.md, "FedScale's traces"): ``--devices fedscale:PATH`` reads its client
device-capacity pickle, ``--availability fedscale:PATH`` its client availability (behaviour) pickle.

The formats, as FedScale reads them (SymbioticLab/FedScale):

* ``client_device_capacity``: ``{client id: {'computation': ms, 'communication': kbps}}``.
  ``fedscale/cloud/internal/client_metadata.py`` (``ClientMetadata.get_completion_time``): ``computation`` is the
  inference latency in ms a sample, a training sample costing 3x that (``augmentation_factor=3.0``), and
  ``communication`` the bandwidth in kbit/s, the transfer taking ``(upload_size + download_size) / bandwidth``
  seconds with the sizes in kbit (``aggregator.py``: ``model_update_size = ... / 1024.0 * 8.``).
* ``client_behave_trace``: ``{client id: {'duration', 'inactive', 'finish_time', 'active'}}``.
  ``ClientMetadata.is_active``: a client is on at time t when ``active[j] <= t % finish_time <= inactive[j]`` for
  some j (``active`` the starts, ``inactive`` the ends, seconds, repeating every ``finish_time``).

Client i of a run is FedScale's client id i + 1 (its ids start at 1) and takes the entry ``keys[(i + 1) % len]`` in
the file's order (``client_manager.py``: ``user_trace_keys[clientId % len(user_trace)]``), both files alike.

Mapping onto the width-aware clock: a training sample at full width takes FedScale's 3 x ``computation`` ms, and
the clock's sample at full width takes :data:`~hasfl_ray.clock.cost.TRAIN_FACTOR` (3) x the model's forward MACs /
speed, so speed = forward MACs at width 1 / (``computation`` / 1000) MACs/s (narrower widths take less, by the
model's cost table); bandwidth both ways = ``communication`` x 1000 / 8 bytes/s; latency 0.

The pickles are read by a restricted unpickler that builds only dicts, lists, tuples, numbers, strings and booleans:
any other object (a class, a function, ``os.system``) is refused unexecuted, in one sentence.
"""

from __future__ import annotations

import io
import math
import pickle
from typing import Any, List, Tuple

import numpy as np

from hasfl_ray.clock.availability import INF, TraceAvailability
from hasfl_ray.clock.profiles import DeviceProfiles
from hasfl_ray.clock.spec import DEVICE_BOUNDS, MAX_SECONDS, MIN_PERIOD, bound_text
from hasfl_ray.errors import DataError
from hasfl_ray.files import read_regular

PREFIX = "fedscale:"
CAPACITY_KEYS = ("computation", "communication")
BEHAVE_KEYS = ("active", "inactive", "finish_time")
CAPACITY_EXPECTED = "FedScale's client_device_capacity format (docs/clock.md)"
BEHAVE_EXPECTED = "FedScale's client_behave_trace format (docs/clock.md)"


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle asked for a global (a class, a function): never imported, never called."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds what pickle's own opcodes build (dicts, lists, tuples, numbers, strings); every global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if all(part.isidentifier() for part in module.split(".")) and name.isidentifier():
            raise _RefusedGlobal(f"{module}.{name}")
        raise pickle.UnpicklingError("no pickle")  # text read as a GLOBAL opcode ('c' + a line): not a pickle


def load_plain(path: str, what: str, expected: str) -> Any:
    """The object pickled in ``path`` when it is built of plain values only; one DataError sentence otherwise."""
    payload = read_regular(path, what)
    try:
        return _PlainUnpickler(io.BytesIO(payload)).load()
    except _RefusedGlobal as error:
        text = " ".join(str(error).split())[:60]
        raise DataError(f"{what} {path!r} asks to build {text}, which a trace never holds (refused, not "
                        f"executed); expected {expected}") from None
    except Exception as error:  # noqa: BLE001 (EOFError, ValueError, MemoryError... of a corrupt file)
        raise DataError(f"{what} {path!r} is not a readable pickle ({type(error).__name__}); expected "
                        f"{expected}") from None


def _entries(path: str, what: str, expected: str, keys: Tuple[str, ...], num_clients: int) -> List[Any]:
    """The entries of the pickled mapping ``path`` dealt to the run's clients (client i: ``keys[(i + 1) % len]``),
    each checked to be a mapping holding ``keys``."""
    table = load_plain(path, what, expected)
    if not isinstance(table, dict) or not table:
        raise DataError(f"{what} {path!r} holds {type(table).__name__}"
                        f"{' (empty)' if isinstance(table, dict) else ''}; expected {expected}")
    ids = list(table)
    for client_id in ids:
        entry = table[client_id]
        missing = [key for key in keys if not isinstance(entry, dict) or key not in entry]
        if missing:
            raise DataError(f"{what} {path!r} has no {missing[0]!r} for client {client_id!r}; expected {expected}")
    return [(ids[(i + 1) % len(ids)], table[ids[(i + 1) % len(ids)]]) for i in range(num_clients)]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def read_capacity(path: str, num_clients: int, full_macs: int) -> DeviceProfiles:
    """The run's device profiles from FedScale's capacity pickle ``path`` (the module's mapping); ``full_macs``:
    the model's forward MACs a sample at width 1. One sentence for a missing key, a speed or bandwidth <= 0 (or
    outside the clock's bounds), or a file that is not such a pickle."""
    what = "FedScale device trace"
    speed, rate = np.empty(num_clients), np.empty(num_clients)
    for i, (client_id, entry) in enumerate(_entries(path, what, CAPACITY_EXPECTED, CAPACITY_KEYS, num_clients)):
        ms, kbps = _number(entry["computation"]), _number(entry["communication"])
        for key, value in (("computation", ms), ("communication", kbps)):
            if not (math.isfinite(value) and value > 0):
                raise DataError(f"{what} {path!r} has {key} {entry[key]!r} for client {client_id!r}; expected a "
                                f"number > 0 ({'ms a sample' if key == 'computation' else 'kbit/s'})")
        speed[i], rate[i] = full_macs / (ms / 1000.0), kbps * 1000.0 / 8.0
    for kind, values, key in (("speed", speed, "computation"), ("down", rate, "communication")):
        low, high, _ = DEVICE_BOUNDS[kind]
        outside = ~((values >= low) & (values <= high))
        if outside.any():
            raise DataError(f"{what} {path!r} gives client {int(np.argmax(outside))} a {kind} of "
                            f"{float(values[np.argmax(outside)]):.3g} (from its {key}); expected one within "
                            f"{bound_text(kind)}")
    return DeviceProfiles(speed, rate.copy(), rate.copy(), np.zeros(num_clients), source=f"FedScale trace {path}")


def read_behave(path: str, num_clients: int) -> "FedScaleAvailability":
    """The availability of the run's clients from FedScale's behaviour pickle ``path`` (the module's mapping):
    per client its on-intervals [active[j], inactive[j]] repeating every ``finish_time``. One sentence for a missing
    key, lists of different lengths, intervals not ascending or beyond ``finish_time``, or a bad file."""
    what = "FedScale availability trace"
    offsets, starts, ends, periods = [0], [], [], np.empty(num_clients)
    for i, (client_id, entry) in enumerate(_entries(path, what, BEHAVE_EXPECTED, BEHAVE_KEYS, num_clients)):
        on, off, finish = entry["active"], entry["inactive"], _number(entry["finish_time"])
        if not (math.isfinite(finish) and MIN_PERIOD <= finish <= MAX_SECONDS):
            raise DataError(f"{what} {path!r} has finish_time {entry['finish_time']!r} for client {client_id!r}; "
                            f"expected seconds within [{MIN_PERIOD:g}, {MAX_SECONDS:g}]")
        if not isinstance(on, (list, tuple)) or not isinstance(off, (list, tuple)) or len(on) != len(off) \
                or not on:
            raise DataError(f"{what} {path!r} has active {_short(on)} and inactive {_short(off)} for client "
                            f"{client_id!r}; expected two lists of seconds of one length, at least one each")
        last = -math.inf
        for start, end in zip(map(_number, on), map(_number, off)):
            if not (math.isfinite(start) and math.isfinite(end) and last <= start <= end <= finish and start >= 0):
                raise DataError(f"{what} {path!r} has the interval {start:g}-{end:g} for client {client_id!r}; "
                                f"expected ascending intervals 0 <= active <= inactive <= finish_time ({finish:g})")
            if end > start:  # an instant on (start == end) is never long enough to train in
                if starts and len(starts) > offsets[-1] and start == ends[-1]:
                    ends[-1] = end  # touching intervals are one stretch on
                else:
                    starts.append(start)
                    ends.append(end)
            last = end
        if len(starts) == offsets[-1]:
            raise DataError(f"{what} {path!r} gives client {client_id!r} no interval of positive length; expected "
                            "at least one active < inactive")
        offsets.append(len(starts))
        periods[i] = finish
    return FedScaleAvailability(np.asarray(offsets, dtype=np.int64), np.asarray(starts, dtype=np.float64),
                                np.asarray(ends, dtype=np.float64), periods)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class FedScaleAvailability(TraceAvailability):
    """:class:`TraceAvailability` with a period per client (FedScale's ``finish_time``): every answer for a client
    is the trace model's with that client's period."""

    def __init__(self, offsets: np.ndarray, starts: np.ndarray, ends: np.ndarray, periods: np.ndarray):
        super().__init__(offsets, starts, ends, float(np.max(periods)))
        self.periods = np.asarray(periods, dtype=np.float64)

    def window(self, client: int, time: float) -> Tuple[bool, float]:
        self.period = float(self.periods[client])
        return super().window(client, time)

    def next_on(self, client: int, time: float) -> float:
        self.period = float(self.periods[client])
        return super().next_on(client, time)

    def longest_on(self) -> np.ndarray:
        counts = np.diff(self.offsets)
        longest = np.full(len(counts), INF)
        has = counts > 0
        lengths = self.ends - self.starts
        firsts, lasts = self.offsets[:-1][has], self.offsets[1:][has] - 1
        best = np.maximum.reduceat(lengths, firsts) if has.any() else np.zeros(0)
        wrap = (self.ends[lasts] == self.periods[has]) & (self.starts[firsts] == 0.0)
        best = np.where(wrap, np.maximum(best, lengths[lasts] + lengths[firsts]), best)
        best[wrap & (counts[has] == 1)] = INF
        longest[has] = best
        return longest

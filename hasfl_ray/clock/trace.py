"""Reading a device trace (docs/clock.md, "Trace format"), streamed and bounded: a memory estimate from the file's
size first (:data:`TRACE_MEMORY_FACTOR` bytes of memory a byte of the file at most), refused in one sentence beyond
this machine's memory; then the rows, one at a time, into compact arrays (read whole into Python lists, a trace had
taken 38 times its size); then, before the intervals are dealt to the run's clients, the memory that takes.

Every value is checked on its line: the four numbers within :data:`hasfl_ray.clock.spec.DEVICE_BOUNDS`, the
availability intervals ascending, not overlapping, their ends at most ``MAX_SECONDS`` and their period at least
``MIN_PERIOD``, client ids integers, each once."""

from __future__ import annotations

import csv
import io
import math
import os
import re
from array import array
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.clock.spec import DEVICE_BOUNDS, MAX_SECONDS, MIN_PERIOD, bound_text
from hasfl_ray.data.memory import _size, physical_memory
from hasfl_ray.errors import DataError
from hasfl_ray.files import open_regular

#: A client id as the trace must write it (tests/cli/test_bad_input_tracebacks.py).
_ASCII_INTEGER = re.compile(r"-?[0-9]+")

#: The trace's columns: one of the first two may name the client; the four numbers are required; availability is
#: optional.
TRACE_ID_COLUMNS = ("client", "name")
TRACE_NUMBER_COLUMNS = ("speed_macs_per_s", "down_bytes_per_s", "up_bytes_per_s", "latency_s")
TRACE_AVAILABILITY = "availability"
#: The kind of device value (:data:`hasfl_ray.clock.spec.DEVICE_BOUNDS`) each number column holds.
DEVICE_KINDS = ("speed", "down", "up", "latency")

TRACE_EXPECTED = ("a CSV with a header of speed_macs_per_s, down_bytes_per_s, up_bytes_per_s, latency_s (optional: "
                  "client or name, availability), docs/clock.md")

#: The most memory reading a trace takes, in bytes a byte of the file: its rows' arrays (32 bytes of numbers, 8 of
#: an id and 8 of an interval count a row, 16 an interval) and their copies in the clients' order, for the
#: shortest rows a trace can have (11 bytes: ``0,1,1,1,0,``; a name column's dictionary included), measured with
#: tracemalloc in tests/clock/test_trace_memory.py.
TRACE_MEMORY_FACTOR = 16
#: Bytes an availability interval takes once dealt to a client (its start and end, float64).
BYTES_PER_INTERVAL = 16


def check_trace_memory(path: str, size: int, total: Optional[int] = None) -> None:
    """Refuse, in one sentence, a trace of ``size`` bytes whose reading would not fit in this machine's memory."""
    total = physical_memory() if total is None else total
    needed = size * TRACE_MEMORY_FACTOR
    if total is not None and needed > total:
        raise DataError(f"device trace {path!r} is {_size(size)}, which needs about {_size(needed)} of memory to read "
                        f"({TRACE_MEMORY_FACTOR} bytes a byte) but this machine has {_size(total)}; expected a trace "
                        f"of at most {_size(total // TRACE_MEMORY_FACTOR)} (a pool of devices is dealt in turn)")


def read_trace_arrays(path: str, num_clients: int, names: Optional[Sequence[str]] = None,
                      total: Optional[int] = None) -> Tuple[List[np.ndarray], Optional[tuple]]:
    """The four device columns in the clients' order (speed, down, up, latency) and the availability intervals
    (CSR: offsets, starts, ends, period; None without any) of the CSV trace ``path``. With a ``client`` column each
    client of the run has its row (ids 0..N-1, each once); with ``name``, the rows are matched to the dataset's
    client names; with neither, the rows are a pool of devices dealt in order (client i takes row i mod rows). One
    :class:`DataError` sentence for a malformed file or one that cannot fit in memory (``total``: the memory to
    fit in; this machine's by default)."""
    what = "device trace"
    with open_regular(path, what) as handle:
        check_trace_memory(path, os.fstat(handle.fileno()).st_size, total)
        text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
        reader = csv.reader(text)
        try:
            rows = _Rows(path, reader)
        except UnicodeDecodeError:
            raise DataError(f"{what} {path!r} is not UTF-8 text; expected {TRACE_EXPECTED}") from None
        except csv.Error as error:
            limit = csv.field_size_limit()
            if "field limit" in str(error):  # a well-formed CSV whose field is longer than the reader takes
                raise DataError(f"{what} {path!r} has a field longer than {limit:,} characters on line "
                                f"{reader.line_num}; expected fields of at most {limit:,} characters (an "
                                "availability column is a few intervals)") from None
            raise DataError(f"{what} {path!r} is not a CSV file ({error}); expected {TRACE_EXPECTED}") from None
    order = rows.order(num_clients, names)
    numbers = np.frombuffer(rows.numbers, dtype=np.float64).reshape(-1, 4)
    intervals = rows.dealt(order, total)
    return [np.ascontiguousarray(numbers[order, k]) for k in range(4)], intervals


class _Rows:
    """A trace's rows, read one at a time into arrays: the numbers (4 a row), the ids, the intervals (CSR)."""

    def __init__(self, path: str, reader) -> None:
        self.path, self.what = path, f"device trace {path!r}"
        self.numbers, self.counts, self.starts, self.ends = array("d"), array("q"), array("d"), array("d")
        self.ids: Optional[array] = None
        self.names: Dict[str, int] = {}
        header: Optional[List[str]] = None
        for row in reader:
            if not row or row[0].lstrip().startswith("#"):
                continue
            if header is None:
                header = self._header(row)
                continue
            self._row(row, header, reader.line_num)
        if header is None:
            raise DataError(f"{self.what} is empty; expected {TRACE_EXPECTED}")
        if not self.counts:
            raise DataError(f"{self.what} has a header but no device rows; expected one row per device")

    def _header(self, row: List[str]) -> List[str]:
        header = [name.strip() for name in row]
        missing = [name for name in TRACE_NUMBER_COLUMNS if name not in header]
        unknown = [name for name in header
                   if name not in TRACE_ID_COLUMNS + TRACE_NUMBER_COLUMNS + (TRACE_AVAILABILITY,)]
        if missing or unknown or len(set(header)) != len(header):
            problem = (f"has no column {missing[0]!r}" if missing else f"has an unknown column {unknown[0]!r}"
                       if unknown else "names a column twice")
            raise DataError(f"{self.what} {problem}; expected {TRACE_EXPECTED}")
        ids = [name for name in TRACE_ID_COLUMNS if name in header]
        if len(ids) > 1:
            raise DataError(f"{self.what} has both a client and a name column; expected one of them")
        self.id_column = ids[0] if ids else None
        if self.id_column == "client":
            self.ids = array("q")
        self.positions = [header.index(name) for name in TRACE_NUMBER_COLUMNS]
        self.id_position = header.index(self.id_column) if self.id_column else None
        self.availability = header.index(TRACE_AVAILABILITY) if TRACE_AVAILABILITY in header else None
        return header

    def _row(self, row: List[str], header: List[str], line: int) -> None:
        if len(row) != len(header):
            raise DataError(f"{self.what} has {len(row)} fields on line {line}; expected {len(header)}, one per "
                            "column")
        for position, name, kind in zip(self.positions, TRACE_NUMBER_COLUMNS, DEVICE_KINDS):
            cell = row[position].strip()
            try:
                value = float(cell)
            except ValueError:
                value = math.nan
            low, high, _ = DEVICE_BOUNDS[kind]
            if not (math.isfinite(value) and low <= value <= high):  # (low is 1 for a rate: never 0)
                raise DataError(f"{self.what} has {name} {cell!r} on line {line}; expected a number within "
                                f"{bound_text(kind)}")
            self.numbers.append(value)
        if self.id_column is not None:
            self._identify(row[self.id_position].strip(), line)
        self.counts.append(self._intervals(row[self.availability] if self.availability is not None else "", line))

    def _identify(self, key: str, line: int) -> None:
        if self.ids is not None:  # a client id: an integer, in ASCII digits (int() takes '١' and '1_0' too)
            try:
                if not _ASCII_INTEGER.fullmatch(key):
                    raise ValueError(key)
                self.ids.append(int(key))
                return
            except (ValueError, OverflowError):
                raise DataError(f"{self.what} has client {key!r} on line {line}; expected an integer client id "
                                "(0 to the run's clients - 1)") from None
        if key in self.names:
            raise DataError(f"{self.what} gives name {key!r} twice; expected each name once")
        self.names[key] = len(self.counts)

    def _intervals(self, text: str, line: int) -> int:
        """``START-END START-END ...`` (seconds, ascending, not overlapping) appended to the flat arrays,
        intervals that touch joined into one (``0-0.05 0.05-100`` is ``0-100``: a client on across the joint never
        goes off there); returns how many were appended (0: always available)."""
        count = 0
        for part in text.split():
            start, dash, end = part.partition("-")
            try:
                pair = (float(start), float(end)) if dash else None
            except ValueError:
                pair = None
            if pair is None or not all(math.isfinite(x) for x in pair) or \
                    not 0 <= pair[0] < pair[1] <= MAX_SECONDS or (count and pair[0] < self.ends[-1]):
                raise DataError(f"{self.what} has availability interval {part!r} on line {line}; expected "
                                f"START-END seconds, 0 <= START < END <= {MAX_SECONDS:g}, ascending, not "
                                "overlapping, space-separated (0-3600 7200-10800)")
            if count and pair[0] == self.ends[-1]:
                self.ends[-1] = pair[1]
            else:
                self.starts.append(pair[0])
                self.ends.append(pair[1])
                count += 1
        return count

    def order(self, num_clients: int, names: Optional[Sequence[str]]) -> np.ndarray:
        """The trace row of every client of the run (see :func:`read_trace`)."""
        rows = len(self.counts)
        if self.id_column is None:
            return np.arange(num_clients, dtype=np.int64) % rows
        order = np.full(num_clients, -1, dtype=np.int64)
        if self.ids is not None:
            ids = np.frombuffer(self.ids, dtype=np.int64)
            distinct, first, seen = np.unique(ids, return_index=True, return_counts=True)
            if (seen > 1).any():
                raise DataError(f"{self.what} gives client {str(distinct[np.argmax(seen > 1)])!r} twice; expected "
                                "each client once")
            inside = (distinct >= 0) & (distinct < num_clients)
            order[distinct[inside]] = first[inside]
            key = "client"
            wanted = None
        else:
            wanted = [str(name) for name in (names or [])]
            for client, name in enumerate(wanted[:num_clients]):
                order[client] = self.names.get(name, -1)
            key = "name"
        absent = np.flatnonzero(order < 0)
        if len(absent):
            shown = str(absent[0]) if wanted is None else wanted[absent[0]] if absent[0] < len(wanted) else ""
            raise DataError(f"{self.what} has no row for {key} {shown!r} ({len(absent)} of the run's {num_clients} "
                            "clients have none); expected a row for every client")
        return order

    def dealt(self, order: np.ndarray, total: Optional[int] = None):
        """The availability intervals in the clients' order (CSR: offsets, starts, ends, period), None without any;
        one sentence when dealing them to the clients would not fit in memory (a pool row's intervals are every
        client's that takes it)."""
        if not len(self.starts):
            return None
        period = max(self.ends)
        if period < MIN_PERIOD:  # time / period would overflow the cycle count, or lose every digit of the time
            raise DataError(f"{self.what} has an availability period of {period:g} s (its largest END); expected "
                            f"at least {MIN_PERIOD:g} s")
        counts = np.frombuffer(self.counts, dtype=np.int64)
        per_client = counts[order]
        needed = int(per_client.sum()) * BYTES_PER_INTERVAL
        total = physical_memory() if total is None else total
        if total is not None and needed > total:
            raise DataError(f"{self.what} deals {int(per_client.sum()):,} availability intervals to the run's "
                            f"{len(order):,} clients, about {_size(needed)} of memory, but this machine has "
                            f"{_size(total)}; expected fewer intervals a device or fewer clients")
        row_start = np.concatenate([[0], np.cumsum(counts)])
        offsets = np.concatenate([[0], np.cumsum(per_client)])
        index = np.repeat(row_start[order] - offsets[:-1], per_client) + np.arange(offsets[-1])
        starts, ends = np.frombuffer(self.starts, dtype=np.float64), np.frombuffer(self.ends, dtype=np.float64)
        return offsets, starts[index], ends[index], float(period)

"""RUN/metrics.csv (issue 45 item 5): metrics.jsonl's scalar keys, one row a round, for a spreadsheet or
``pandas.read_csv``.

Its columns are fixed by the kind of run, in this order: the keys every line has (:data:`BASE`), the device clock's
(:data:`CLOCKED`, a run with a device population) and the asynchronous ones (:data:`ASYNC`), ``wall_s`` last; a
scalar key a line has beyond those (a later version's) follows, in the order it first appears. A key a line lacks
(``local_accuracy_mean`` on a round without a local-accuracy pass) or holds as null is an empty cell. Nested keys
(``frozen_by_layer``, ``accuracy_at_width``, ``train_loss_by_client``, ...) stay in metrics.jsonl only.

The file is written with metrics.jsonl, whole and atomically, each time a line is added, and rebuilt from the
checkpoint's lines on ``--resume``: it always holds the same rounds as metrics.jsonl.
"""

from __future__ import annotations

import csv
import io
import math
import numbers
from typing import Any, Dict, List, Mapping, Sequence

#: The columns of every run (``local_accuracy_mean`` and ``_worst``: empty on rounds without a local-accuracy pass).
BASE = ("round", "test_accuracy", "test_loss", "train_loss", "avg_p", "coverage", "frozen_fraction", "mean_h",
        "rejected_updates", "local_accuracy_mean", "local_accuracy_worst")
#: A clocked run's (docs/clock.md), present when its first line has ``sim_time_s``.
CLOCKED = ("sim_time_s", "round_time_s", "idle_s", "bytes_down", "bytes_up", "invited", "late_updates",
           "dropped_updates", "partial_updates", "unavailable_clients")
#: An asynchronous run's (docs/async.md), present when its first line has ``version``.
ASYNC = ("version", "staleness_mean", "staleness_max", "buffer_fill", "in_flight")
LAST = "wall_s"


def scalar(value: Any) -> bool:
    """A value metrics.csv holds: a number or null (never a nested object, a list or a sentence)."""
    return value is None or isinstance(value, numbers.Real)  # numpy's numbers too (the clock's times)


def columns(lines: Sequence[Mapping[str, Any]]) -> List[str]:
    """metrics.csv's header for ``lines`` (see the module's docstring)."""
    first = lines[0] if lines else {}
    known = list(BASE) + (list(CLOCKED) if "sim_time_s" in first else []) + \
        (list(ASYNC) if "version" in first else []) + [LAST]
    seen = set(known) | set(CLOCKED) | set(ASYNC)
    extra: List[str] = []
    for line in lines:
        for key, value in line.items():
            if key not in seen and value is not None and scalar(value):
                seen.add(key)
                extra.append(key)
    return known + extra


def cell(value: Any) -> Any:
    """A value as metrics.csv writes it: empty for null (or a non-finite number), repr-exact floats."""
    if value is None or not scalar(value) or not math.isfinite(value):
        return ""
    return int(value) if isinstance(value, numbers.Integral) else repr(float(value))


def rows_text(header: Sequence[str], lines: Sequence[Mapping[str, Any]]) -> str:
    """The CSV rows of ``lines`` under ``header`` (no header line)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([cell(line.get(key)) for key in header] for line in lines)
    return out.getvalue()


class MetricsTable:
    """metrics.csv's text, kept beside metrics.jsonl's: a row added per line; the whole text rebuilt only when a
    line brings a column the header lacks."""

    def __init__(self) -> None:
        self.lines: List[Dict[str, Any]] = []
        self.header: List[str] = columns([])
        self.text = ""

    def reset(self, lines: Sequence[Mapping[str, Any]]) -> str:
        self.lines = [dict(line) for line in lines]
        self.header = columns(self.lines)
        self.text = rows_text(self.header, self.lines)
        return self.render()

    def add(self, line: Mapping[str, Any]) -> str:
        """The file's text with ``line`` added (kept only by :meth:`commit`, once the file is written)."""
        lines = self.lines + [dict(line)]
        header = columns(lines)
        text = rows_text(header, lines) if header != self.header else self.text + rows_text(header, [line])
        self._next = (lines, header, text)
        return _with_header(header, text)

    def commit(self) -> None:
        self.lines, self.header, self.text = self._next

    def render(self) -> str:
        return _with_header(self.header, self.text)


def _with_header(header: Sequence[str], text: str) -> str:
    return ",".join(header) + "\n" + text
